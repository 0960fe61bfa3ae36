"""`python -m relax_gym_core.client`: same as the `relax-gym-client` console script."""

import sys

from relax_gym_core.client.main import main

sys.exit(main())
