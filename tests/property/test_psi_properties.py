"""Properties of the mutual PSI: equal to a plain set intersection, never more."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parties.alignment.psi import DuplicateIds, check_ids, mutual_psi_local, shared_mask

_ID = st.text(alphabet="abcdef0123456789-", min_size=1, max_size=6)


@settings(max_examples=60)
@given(a=st.lists(_ID, max_size=25, unique=True), b=st.lists(_ID, max_size=25, unique=True),
       chunk=st.integers(1, 8))
def test_mutual_psi_equals_set_intersection(a: list[str], b: list[str], chunk: int) -> None:
    ra, rb = mutual_psi_local(a, b, chunk_size=chunk)
    want = sorted(set(a) & set(b))
    assert list(ra.ids) == want and list(rb.ids) == want
    # each output names only shared IDs, through its own rows
    assert [a[r] for r in ra.rows] == want and [b[r] for r in rb.rows] == want
    assert not set(ra.ids) - set(b) and not set(rb.ids) - set(a)
    assert (ra.n_own, ra.n_partner, rb.n_own, rb.n_partner) == (len(a), len(b), len(b), len(a))


@settings(max_examples=60)
@given(a=st.lists(_ID, min_size=1, max_size=20), data=st.data())
def test_inputs_with_duplicates_are_rejected(a: list[str], data: st.DataObject) -> None:
    dup = data.draw(st.sampled_from(a))
    at = data.draw(st.integers(0, len(a)))
    ids = a[:at] + [dup] + a[at:]
    with pytest.raises(DuplicateIds) as ei:
        check_ids(ids)
    assert ids[ei.value.first_row] == ids[ei.value.dup_row]
    assert ei.value.n_duplicates == len(ids) - len(set(ids))


@settings(max_examples=100)
@given(own=st.lists(st.binary(min_size=16, max_size=16), max_size=40, unique=True),
       partner=st.lists(st.binary(min_size=16, max_size=16), max_size=40, unique=True))
def test_shared_mask_equals_set_membership(own: list[bytes], partner: list[bytes]) -> None:
    # raw 16-byte keys, including ones that end in zero bytes
    def arr(xs: list[bytes]) -> np.ndarray:
        return np.frombuffer(b"".join(xs), "S16") if xs else np.empty(0, "S16")

    got = shared_mask(arr(own), arr(partner)).tolist()
    assert got == [x in set(partner) for x in own]
