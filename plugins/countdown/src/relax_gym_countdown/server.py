"""The resources server of the environment countdown,
the NeMo Gym environment's side.
It imports NeMo Gym, the standard library and relax_gym_core.ingym only: that interpreter has NeMo Gym's
dependencies, not relax-gym's."""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)


# NeMo Gym's classes are untyped for mypy: subclassing them needs `type: ignore[misc]`.
class CountdownVerifyRequest(BaseVerifyRequest):  # type: ignore[misc]
    # A row's own fields reach /verify at the top level of the body: declare the ones the verifier reads.
    numbers: list[int]
    target: int


OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def value(node: ast.expr, unused: list[int]) -> Fraction:
    """The exact value of an expression of the given numbers (each used at most once) and + - * /."""
    if isinstance(node, ast.Constant) and type(node.value) is int and node.value in unused:
        unused.remove(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        left, right = value(node.left, unused), value(node.right, unused)
        return Fraction(OPERATORS[type(node.op)](left, right))
    raise ValueError("not an expression of the given numbers")


class CountdownResourcesServer(SimpleResourcesServer):  # type: ignore[misc]
    config: BaseResourcesServerConfig

    async def verify(self, body: CountdownVerifyRequest) -> BaseVerifyResponse:
        answer = body.response.output_text.strip()  # the text of the model's assistant messages
        try:
            solved = value(ast.parse(answer, mode="eval").body, list(body.numbers)) == body.target
        except (SyntaxError, ValueError, ZeroDivisionError):
            solved = False
        return BaseVerifyResponse(**body.model_dump(), reward=1.0 if solved else 0.0)


if __name__ == "__main__":
    CountdownResourcesServer.run_webserver()
