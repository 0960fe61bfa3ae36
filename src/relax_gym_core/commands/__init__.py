"""The commands of `relax-gym` above the gateway: serve, up, probe, plugins, convert (cli.py parses)."""
