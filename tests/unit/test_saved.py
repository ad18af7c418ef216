"""Saved models (parties.runtime.saved) and serialisable encoders (parties.data.encoders)."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import orjson
import pandas as pd
import pytest
import torch

from parties.config import DataSection, ModelSection, VflConfig
from parties.data import UnknownColumn, encode_party_features
from parties.data.encoders import EncoderFormatError, FittedEncoder
from parties.models.model import flat_params, load_flat
from parties.runtime.saved import (
    FORMAT_VERSION,
    SavedModelError,
    SavedModelMismatch,
    check_same_run,
    load_party_model,
    part_dir,
    save_party_model,
)
from parties.models.zoo import ModelFactory


def _frame() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    n = 40
    return pd.DataFrame({
        "a": rng.normal(3.0, 2.0, n),
        "b": rng.choice(["x", "y", None], n),
        "c": np.where(rng.random(n) < 0.2, np.nan, rng.integers(0, 9, n).astype(float)),
        "flag": rng.random(n) < 0.5,
    })


def test_fitted_encoder_reproduces_the_sklearn_encoding_exactly() -> None:
    frame = _frame()
    train, held = np.arange(30), np.arange(30, 40)
    feats = encode_party_features(frame, ["a", "b", "c", "flag"], train, held)
    enc = FittedEncoder.from_dict(orjson.loads(orjson.dumps(feats.encoder.to_dict())))
    assert enc == feats.encoder and enc.feature_names == feats.feature_names
    assert np.array_equal(enc.transform(frame.iloc[held]), feats.x_test)
    assert np.array_equal(enc.transform(frame.iloc[train]), feats.x_train)
    new = pd.DataFrame({"a": [np.nan], "b": ["unseen"], "c": [1.0], "flag": [True]})
    row = enc.transform(new)[0]
    names = enc.feature_names
    assert row[names.index("a")] == pytest.approx((enc.columns[0].fill - enc.columns[0].mean)
                                                  / enc.columns[0].scale)
    assert all(row[i] == 0 for i, n in enumerate(names) if n.startswith("b="))
    with pytest.raises(UnknownColumn):
        enc.transform(new.drop(columns=["c"]))
    with pytest.raises(EncoderFormatError, match="format"):
        FittedEncoder.from_dict({**enc.to_dict(), "format": 99})


def test_a_saved_encoder_clips_new_rows_to_the_training_quantiles() -> None:
    frame = _frame()
    train, held = np.arange(30), np.arange(30, 40)
    feats = encode_party_features(frame, ["a", "c"], train, held)
    saved = feats.encoder.to_dict()
    assert all(np.isfinite([c["lo"], c["hi"]]).all() for c in saved["columns"])
    enc = FittedEncoder.from_dict(orjson.loads(orjson.dumps(saved)))
    assert enc == feats.encoder
    a = enc.columns[0]
    far = pd.DataFrame({"a": [200.0 * frame["a"].max(), -1e9], "c": [1.0, 1.0]})
    np.testing.assert_allclose(enc.transform(far)[:, 0],
                               [(a.hi - a.mean) / a.scale, (a.lo - a.mean) / a.scale],
                               rtol=1e-6)
    # an encoder saved before in-memory clipping (no lo/hi) still reads, unclipped
    old = {**saved, "columns": [{k: v for k, v in c.items() if k not in ("lo", "hi")}
                                for c in saved["columns"]]}
    unclipped = FittedEncoder.from_dict(old).transform(far)[:, 0]
    assert unclipped[0] == pytest.approx((far["a"][0] - a.mean) / a.scale, rel=1e-6)


def _fake_party(role: str, cfg: VflConfig, tmp: Path) -> SimpleNamespace:
    frame = _frame()
    cols = ("a", "b") if role == "active" else ("c", "flag")
    feats = encode_party_features(frame, cols, np.arange(30), np.arange(30, 40))
    factory = ModelFactory(cfg)
    torch.manual_seed(5)
    mods = factory.modules(role, feats.x_train.shape[1])
    with torch.no_grad():  # "trained": move off the initialisation, buffers too
        for m in mods:
            for p in m.parameters():
                p.add_(0.5)
            for b in m.buffers():
                if b.is_floating_point():
                    b.add_(0.25)
    data = SimpleNamespace(columns=cols, x_train=feats.x_train, n_rows=len(frame),
                           encoder=feats.encoder, task="binary", label="y",
                           label_positive="yes", label_mean=0.0, label_std=1.0)

    def trained_modules() -> list[torch.nn.Module]:
        for m in mods:
            m.eval()
        return mods

    return SimpleNamespace(role=role, party=role, cfg=cfg, data=data, models=factory,
                           dp_acct=None,
                           trained_modules=trained_modules)


@pytest.mark.parametrize("model", ["mlp", "resnet"])
def test_save_load_roundtrip_for_both_roles(tmp_path: Path, model: str) -> None:
    cfg = VflConfig(model=ModelSection(bottom=model, resnet_depth=1, resnet_width=8, resnet_norm="batch", embedding_dim=4, bottom_hidden=(6,), top_hidden=(5,)))
    for role in ("active", "passive"):
        party = _fake_party(role, cfg, tmp_path)
        out = save_party_model(tmp_path, party, run_id="r1")
        assert out == part_dir(tmp_path, role)
        part = load_party_model(tmp_path, role)
        m = part.manifest
        assert m["format_version"] == FORMAT_VERSION and m["run_id"] == "r1"
        assert m["role"] == role and m["columns"] == list(party.data.columns)
        assert m["embedding_dim"] == 4 and m["model"]["model"] == model
        assert m["torch_version"] == torch.__version__ and len(m["weights"]["sha256"]) == 64
        assert ("label" in m) == (role == "active")
        saved = party.trained_modules()
        assert torch.equal(flat_params(part.modules), flat_params(saved))
        assert all(not mod.training for mod in part.modules)
        x = torch.from_numpy(part.encoder.transform(_frame().iloc[30:]))
        assert torch.equal(part.modules[0](x), saved[0](x))
        assert part.cfg == cfg
    a, p = load_party_model(tmp_path, "active"), load_party_model(tmp_path, "passive")
    check_same_run(a.identity, p.identity)
    if model == "resnet":  # running statistics travel with the weights
        bn = part.modules[0].blocks[0].f[1]
        assert torch.all(bn.running_var > 1.0)


def test_load_refuses_tampered_weights_other_versions_and_other_runs(tmp_path: Path) -> None:
    cfg = VflConfig(model=ModelSection(embedding_dim=4, bottom_hidden=(6,), top_hidden=(5,)))
    save_party_model(tmp_path, _fake_party("passive", cfg, tmp_path), run_id="r1")
    path = part_dir(tmp_path, "passive")
    mpath = path / "manifest.json"
    good = orjson.loads(mpath.read_bytes())
    mpath.write_bytes(orjson.dumps({**good, "format_version": 99}))
    with pytest.raises(SavedModelError, match="format version 99"):
        load_party_model(tmp_path, "passive")
    mpath.write_bytes(orjson.dumps(good))
    w = path / "weights.pt"
    w.write_bytes(w.read_bytes() + b"x")
    with pytest.raises(SavedModelError, match="sha256"):
        load_party_model(tmp_path, "passive")
    shutil.rmtree(path)
    with pytest.raises(SavedModelError, match="manifest.json"):
        load_party_model(tmp_path, "passive")
    with pytest.raises(SavedModelMismatch) as ei:
        check_same_run({"run_id": "aaa", "config_digest": "d1"},
                       {"run_id": "bbb", "config_digest": "d1"})
    assert "'aaa'" in str(ei.value) and "'bbb'" in str(ei.value)


def test_load_flat_roundtrip_of_a_model_with_buffers() -> None:
    cfg = VflConfig(model=ModelSection(bottom="resnet", resnet_depth=1, resnet_width=8, resnet_norm="batch"))
    torch.manual_seed(0)
    a = ModelFactory(cfg).modules("active", 3)
    torch.manual_seed(1)
    b = ModelFactory(cfg).modules("active", 3)
    with torch.no_grad():
        a[0].blocks[0].f[1].running_mean.fill_(2.0)
    load_flat(b, flat_params(a))
    assert torch.equal(b[0].blocks[0].f[1].running_mean, torch.full((8,), 2.0))


def test_feature_widths_match_the_encoded_widths(tmp_path: Path) -> None:
    from parties.data.preflight import feature_widths
    from parties.data.party import load_party_data

    frame = _frame()
    frame["y"] = np.arange(len(frame)) % 2
    path = tmp_path / "t.csv"
    frame.to_csv(path, index=False)
    cfg = VflConfig(dataset=str(path), label="y",
                    data=DataSection(active_columns=("a", "b"), passive_columns=("c", "flag")))
    widths = feature_widths(cfg)
    for role in ("active", "passive"):
        assert widths[role] == load_party_data(cfg, role).x_train.shape[1]
    assert widths["active"] == 1 + 3  # a; b = x, y, __missing__
