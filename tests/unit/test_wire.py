"""The cut-layer wire codec (parties.algorithms.wire): round-trip bounds, the auto rule, the config key,
the driver's decoding, and DP accounting unchanged by compression."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from parties.config import DataSection, DpSection, VflConfig, WireSection, WorkersSection
from parties.algorithms.wire import (
    INT8_FLUSH,
    META_KEY,
    WireFormatError,
    decode_rows,
    encode_message,
    encode_rows,
    int8_decode,
    int8_encode,
    resolve_wire_dtype,
    wire_bytes,
)
from pubsub.config import ConfigError

_BIG = float(np.float32(1e30))
_FLOATS = st.floats(min_value=-_BIG, max_value=_BIG, allow_nan=False, allow_infinity=False,
                    width=32)


@settings(max_examples=150, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, min_side=1,
                                               max_side=40), elements=_FLOATS))
def test_int8_round_trip_within_half_a_scale_per_row(x: np.ndarray) -> None:
    q, scales = int8_encode(x)
    assert q.dtype == np.int8 and q.shape == x.shape
    assert scales.dtype == np.float32 and scales.shape == (x.shape[0],)
    y = decode_rows([q, scales], "i8")
    assert y.dtype == np.float32 and y.shape == x.shape
    err = np.abs(x.astype(np.float64) - y.astype(np.float64))
    # half a step, plus float32 rounding of the product q * scale (|q| <= 127)
    bound = scales.astype(np.float64)[:, None] * (0.5 + 127 * 2.0**-23)
    # rows flushed to zero (every |value| below INT8_FLUSH) have scale 0 and err < 1e-30
    flushed = np.abs(x).max(axis=1) < INT8_FLUSH
    assert ((scales == 0) == flushed).all() and (err[flushed] < INT8_FLUSH).all()
    assert (err[~flushed] <= bound[~flushed]).all()
    assert (np.abs(q.astype(np.int32)) <= 127).all()


def test_int8_rejects_nan_and_infinity_and_keeps_zero_rows() -> None:
    x = np.zeros((3, 4), np.float32)
    x[1] = [1.0, -2.0, 0.5, 0.0]
    q, s = int8_encode(x)
    assert s[0] == 0 and s[2] == 0 and (q[0] == 0).all()
    np.testing.assert_array_equal(int8_decode(q, s)[0], 0.0)
    assert abs(float(s[1]) - 2.0 / 127) < 1e-9
    for bad in (np.nan, np.inf):
        y = x.copy()
        y[2, 1] = bad
        with pytest.raises(ValueError, match="not finite"):
            int8_encode(y)
        # on a message: sent as float32 as it is, for the receiver's intake to judge
        arrays, tag = encode_rows(y, "int8")
        assert tag is None and arrays[0] is y


@pytest.mark.parametrize("dtype,tag,rel", [("float16", "f16", 2.0**-11),
                                           ("bfloat16", "bf16", 2.0**-8)])
def test_half_precision_round_trip(dtype: str, tag: str, rel: float) -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 32)) * 10.0 ** rng.integers(-3, 3, (64, 1))
         ).astype(np.float32)
    arrays, got = encode_rows(x, dtype)
    assert got == tag and arrays[0].itemsize == 2 and arrays[0].shape == x.shape
    y = decode_rows(arrays, got)
    assert y.dtype == np.float32 and y.shape == x.shape
    ok = np.abs(x) > 1e-4  # float16 subnormals below 6.1e-5 lose relative precision
    assert (np.abs(y - x)[ok] <= rel * np.abs(x)[ok] + 1e-12).all()


def test_out_of_range_or_nan_goes_as_float32() -> None:
    x = np.array([[1.0, 7e4]], np.float32)
    arrays, tag = encode_rows(x, "float16")
    assert tag is None and arrays[0].dtype == np.float32
    top = np.array([[np.finfo(np.float32).max, 1.0]], np.float32)  # rounds to bf16 inf
    for y in (top, np.array([[np.nan, 1.0]], np.float32)):
        arrays, tag = encode_rows(y, "bfloat16")
        assert tag is None and arrays[0] is y
    edge = np.array([[3.3895314e38, -3.3895314e38]], np.float32)  # bf16's largest
    arrays, tag = encode_rows(edge, "bfloat16")
    assert tag == "bf16" and np.isfinite(decode_rows(arrays, tag)).all()


def test_encode_message_tags_a_copy_of_the_meta() -> None:
    x = np.ones((2, 3), np.float32)
    meta = {"e": 0, "b": 1}
    arrays, out = encode_message([x], meta, "int8")
    assert out == {"e": 0, "b": 1, META_KEY: "i8"} and META_KEY not in meta
    assert len(arrays) == 2
    assert encode_message([x], meta, "float32") == ([x], meta)
    assert encode_message([], meta, "int8") == ([], meta)


@pytest.mark.parametrize("arrays,tag", [
    ([np.zeros((2, 3), np.int8)], "i8"),                                     # no scales
    ([np.zeros((2, 3), np.int8), np.zeros(3, np.float32)], "i8"),            # wrong rows
    ([np.zeros((2, 3), np.int16), np.zeros(2, np.float32)], "i8"),           # dtype
    ([np.zeros((2, 3), np.int8), np.array([1.0, np.nan], np.float32)], "i8"),
    ([np.zeros((2, 3), np.int8), np.array([1.0, -1.0], np.float32)], "i8"),
    ([np.zeros((2, 3), np.float32)], "f16"),
    ([np.zeros((2, 3), np.float16)], "bf16"),
    ([np.zeros(3, np.float16)], "f16"),
    ([np.zeros((2, 3), np.float32)], "f8"),
    ([np.zeros((2, 3), np.float32)], 7),
])
def test_malformed_encodings_are_rejected(arrays: list[np.ndarray], tag: object) -> None:
    with pytest.raises(WireFormatError):
        decode_rows(arrays, tag)


def test_auto_compresses_only_a_bandwidth_bound_link() -> None:
    kw = {"batch_size": 256, "embedding_dim": 32}
    assert resolve_wire_dtype("auto", link_mbps=0.0, **kw) == "float32"   # unknown
    assert resolve_wire_dtype("auto", link_mbps=1000.0, **kw) == "float32"  # 0.26 ms
    assert resolve_wire_dtype("auto", link_mbps=100.0, **kw) == "int8"    # 2.6 ms
    assert resolve_wire_dtype("auto", link_mbps=20.0, **kw) == "int8"
    assert resolve_wire_dtype("bfloat16", link_mbps=0.0, **kw) == "bfloat16"
    assert resolve_wire_dtype("float32", link_mbps=20.0, **kw) == "float32"
    with pytest.raises(ValueError):
        resolve_wire_dtype("int4", link_mbps=0.0, **kw)
    assert wire_bytes(256, 32, "int8") * 3.5 < wire_bytes(256, 32, "float32")


def test_config_key() -> None:
    assert VflConfig().wire.dtype == "auto" and VflConfig().effective_wire_dtype == "float32"
    assert VflConfig(wire=WireSection(link_mbps=20)).effective_wire_dtype == "int8"
    for key, value in (("dtype", "int4"), ("link_mbps", -1.0),
                       ("link_mbps", float("nan"))):
        with pytest.raises(ConfigError) as err:
            VflConfig(wire=WireSection(**{key: value}))
        assert f"vfl.wire.{key}" in str(err.value)


def test_driver_decodes_before_the_intake_and_rejects_a_bad_encoding() -> None:
    from parties.algorithms.actions import EMB
    from parties.runtime.driver import ActionDriver
    from parties.algorithms.intake import PeerIntake, TensorSpec
    from pubsub.codec import Message

    class _Log:
        def __init__(self) -> None:
            self.warnings: list[dict[str, object]] = []

        def warning(self, event: str, **kw: object) -> None:
            self.warnings.append(kw)

    log = _Log()
    intake = PeerIntake(partner="passive", max_bad=5, log=log)
    drv = ActionDriver(None, topics=None, handles=[], timeline=None,  # type: ignore[arg-type]
                       intake=intake, specs={EMB: TensorSpec(width=3, max_rows=4)},
                       wire="int8")
    x = np.array([[0.5, -1.0, 2.0], [0.0, 0.1, -0.2]], np.float32)
    arrays, meta = encode_message([x], {"e": 0, "b": 1}, "int8")
    msg = Message(topic="emb/r/1", seq=1, publisher="p", meta=meta, arrays=tuple(arrays))
    got = drv._admit(EMB, msg)
    assert got is not None and META_KEY not in got.meta and len(got.arrays) == 1
    assert np.abs(got.arrays[0] - x).max() <= 2.0 / 127 / 2 + 1e-7
    assert drv._admit(EMB, got) is not None  # a message put back is taken again as it is
    bad = dataclasses.replace(msg, arrays=(arrays[0],))
    assert drv._admit(EMB, bad) is None and intake.rejected == 1


def test_dp_accounting_does_not_depend_on_the_wire() -> None:
    from parties.privacy.dp import plan_from_config

    base = VflConfig(dataset="bank", epochs=3, dp=DpSection(mu=2.0))
    plans = [plan_from_config(dataclasses.replace(base,
                                                  wire=dataclasses.replace(base.wire, dtype=w, link_mbps=20.0)))
             for w in ("float32", "int8", "bfloat16", "auto")]
    assert all(p == plans[0] for p in plans[1:])


def test_a_dp_run_with_int8_on_the_wire_reports_the_planned_mu(tmp_path) -> None:
    """Both parties in one process (memory bus): the passive party's embeddings and the
    active party's gradients travel as int8 after the noise, and the run's accounted µ is
    the plan's, as without compression."""
    from parties.privacy.dp import plan_from_config
    from sim.launch.local import run_vfl_in_process

    cfg = VflConfig(dataset="synthetic", epochs=1, batch_size=128, val_per_epoch=1,
                    active_only_baseline="off",
                    data=DataSection(synthetic_rows=1000, synthetic_features=8, synthetic_informative=4),
                    dp=DpSection(mu=4.0, noise_seed=1), wire=WireSection(dtype="int8"),
                    workers=WorkersSection(mode="inline", active=1, passive=1))
    m = run_vfl_in_process(cfg, tmp_path).metrics
    plan = plan_from_config(dataclasses.replace(cfg,
                                                wire=dataclasses.replace(cfg.wire, dtype="float32")))
    # the calibration is the float32 run's, and the ledger counts publications whatever
    # their encoding: every record at most its one training publication (µ 2.83) and a
    # validation / test record its one release at the whole target (µ 4)
    assert m["dp"]["noise_multiplier"] == plan.noise_multiplier
    assert m["dp"]["sgd_noise_multiplier"] == plan.sgd_noise_multiplier
    assert m["dp"]["publications_max_train"] == 1
    assert m["dp"]["mu"] == pytest.approx(plan.target_mu) == pytest.approx(4.0)
    assert m["dp"]["release_mu"] == pytest.approx(plan.release_mu())
    assert m["parties"]["passive"]["wire_dtype"] == m["parties"]["active"]["wire_dtype"] == "int8"
    # int8 codes and a scale a row: under a third of float32's bytes
    n_train = m["parties"]["passive"]["samples"]
    assert 0 < m["parties"]["passive"]["bytes_sent"]["emb"] < n_train * cfg.model.embedding_dim * 4 / 3
    assert 0 < m["parties"]["active"]["bytes_sent"]["grad"] < n_train * cfg.model.embedding_dim * 4 / 3
