"""The argument-checking contract shared by the CPU op tests of a family (test_ops_kda.py,
test_ops_gdn.py): every named array argument refused, with the op's name in the message and
nothing computed, when it is float64, has one axis too many, or is laid out non-C-contiguous.

``ops`` maps an op's name to (make, call): ``make()`` a fresh dict of valid float32 arguments by
name, ``call(args)`` the op on them. ``contiguous_only_nd``: names left out of the layout test
(1-D arguments, which a transposed copy does not make non-contiguous).
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core

ST = _core.status


def expect_contract(call, code, op):
    """call() raises memra.ContractError with status ``code`` and a message naming ``op``."""
    with pytest.raises(memra.ContractError) as ei:
        call()
    assert ei.value.code == code
    assert op in str(ei.value)


def contract_tests(ops, contiguous_only_nd=()):
    """The three tests, to be bound to test_* names of the calling module."""
    args = [(op, name) for op, (make, _) in ops.items() for name in make()]

    @pytest.mark.parametrize("op,name", args)
    def float64_refused(op, name):
        make, call = ops[op]
        a = make()
        a[name] = a[name].astype(np.float64)
        expect_contract(lambda: call(a), ST.CONTRACT_DTYPE, op)

    @pytest.mark.parametrize("op,name", args)
    def wrong_rank_refused(op, name):
        make, call = ops[op]
        a = make()
        a[name] = a[name][..., None]
        expect_contract(lambda: call(a), ST.CONTRACT_SHAPE, op)

    @pytest.mark.parametrize("op,name", [(op, n) for op, n in args if n not in contiguous_only_nd])
    def non_contiguous_refused(op, name):
        make, call = ops[op]
        a = make()
        # The same shape and values, laid out transposed: a non-C-contiguous view.
        a[name] = np.ascontiguousarray(np.swapaxes(a[name], 0, -1)).swapaxes(0, -1)
        assert not a[name].flags.c_contiguous
        expect_contract(lambda: call(a), ST.CONTRACT_STRIDE, op)

    return float64_refused, wrong_rank_refused, non_contiguous_refused
