"""memra.config.check_grouped_router at its boundaries (the geometry of transformers'
Glm5NextTextTopkRouter / KimiLinearTopkRouter): E experts in n_group groups of at least 2, the
topk_group best groups kept, num_experts_per_tok experts chosen among the kept groups' experts.

The family config tests reach the refusals from far off (a top_k of twice the kept experts); a
top_k equal to the kept experts, which transformers runs (its top-k over the masked scores then
takes every kept expert), went unchecked: mutation testing (docs/testing_mutations.md, Python
layer) refused it without a failing test. The cases are worked by hand from that rule.
"""

from __future__ import annotations

import pytest

from memra.config import check_grouped_router
from memra.errors import ContractError, UnsupportedError


def _router(E: int, G: int, kg: int, k: int) -> dict:
    return {"n_routed_experts": E, "n_group": G, "topk_group": kg, "num_experts_per_tok": k}


@pytest.mark.parametrize("E,G,kg,k", [
    (8, 4, 2, 4),    # top_k == the 2 kept groups' 2 + 2 experts
    (8, 4, 4, 8),    # every group kept, every expert chosen
    (8, 1, 1, 8),    # one group holding all experts
    (4, 2, 1, 2),    # groups of exactly 2 experts
    (8, 4, 2, 1),
])
def test_a_router_at_its_bounds_is_taken(E, G, kg, k) -> None:
    check_grouped_router(_router(E, G, kg, k), "n_routed_experts")


@pytest.mark.parametrize("E,G,kg,k,error,words", [
    (8, 4, 2, 5, UnsupportedError, "exceeds the 4 experts"),   # one past the kept experts
    (8, 4, 5, 1, ContractError, "topk_group (5) exceeds n_group (4)"),
    (8, 8, 1, 1, ContractError, "groups of at least 2"),       # groups of one expert
    (9, 4, 1, 1, ContractError, "groups of at least 2"),       # an uneven split
])
def test_a_router_past_its_bounds_is_refused(E, G, kg, k, error, words) -> None:
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        check_grouped_router(_router(E, G, kg, k), "n_routed_experts")
