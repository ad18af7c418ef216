"""Model factories (parties.models.zoo): built-ins, user callables, probes, buffers in the PS, DP."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from parties.config import DpSection, ModelSection, VflConfig, vfl_config
from parties.privacy.dpsgd import DpIncompatibleModel, DpSgd
from parties.models.model import (
    ParameterServer,
    PassiveCompute,
    Replica,
    bottom_model,
    embed,
    flat_params,
    load_flat,
    party_modules,
    state_tensors,
    top_model,
)
from parties.models.zoo import (
    ModelFactory,
    ModelSpecError,
    ResidualMlp,
    batchnorm_to_groupnorm,
    check_models,
)
from pubsub.config import ConfigError, load_section

USER = "tests.unit.zoo_user_models"


def test_default_mlp_is_bit_for_bit_the_old_construction() -> None:
    cfg = VflConfig(model=ModelSection(bottom_hidden=(16, 8), embedding_dim=4, top_hidden=(6,)))
    torch.manual_seed(3)
    old = [bottom_model(7, (16, 8), 4), top_model(4, (6,))]
    torch.manual_seed(3)
    new = ModelFactory(cfg).modules("active", 7)
    assert torch.equal(flat_params(old), flat_params(new))
    torch.manual_seed(3)
    assert torch.equal(flat_params(party_modules(cfg, "active", 7)), flat_params(old))
    assert state_tensors(new) == [p for m in new for p in m.parameters()]  # no buffers


@pytest.mark.parametrize("norm", ["layer", "batch", "group", "none"])
def test_resnet_shapes_and_norms(norm: str) -> None:
    cfg = VflConfig(model=ModelSection(bottom="resnet", resnet_depth=2, resnet_width=12, resnet_norm=norm, embedding_dim=5))
    f = ModelFactory(cfg)
    bottom, top = f.modules("active", 9)
    assert isinstance(bottom, ResidualMlp) and len(bottom.blocks) == 2
    assert bottom(torch.zeros(3, 9)).shape == (3, 5)
    assert top(torch.zeros(3, 10)).shape == (3, 1)
    kinds = {type(m).__name__ for m in bottom.modules()}
    want = {"layer": "LayerNorm", "batch": "BatchNorm1d", "group": "GroupNorm",
            "none": "Identity"}[norm]
    assert want in kinds
    assert f.describe()["resnet"] == {"depth": 2, "width": 12, "norm": norm, "dropout": 0.0}
    check_models(f, {"active": 9, "passive": 4})


def test_config_validates_model_keys_and_set_works() -> None:
    cfg = load_section(VflConfig, "vfl", None, ["model.bottom=resnet", "model.resnet_depth=1",
                                                f"model.top={USER}:top",
                                                "model.resnet_norm=batch"])
    assert (cfg.model.bottom, cfg.model.resnet_depth, cfg.model.top) == ("resnet", 1, f"{USER}:top")
    for key, value in [("model.bottom", "nope"), ("model.top", "a b:c"),
                       ("model.resnet_depth", -1), ("model.resnet_width", 0),
                       ("model.resnet_norm", "instance"), ("model.resnet_dropout", 1.0),
                       ("dp.batchnorm", "drop")]:
        with pytest.raises(ConfigError) as ei:
            vfl_config({key: value})
        assert ei.value.key == f"vfl.{key}" and repr(value) in str(ei.value)
    with pytest.raises(ConfigError, match="unknown"):
        load_section(VflConfig, "vfl", None, ["model.resnet_deep=2"])
    with pytest.raises(ConfigError, match="moved to vfl.model.resnet_depth"):
        load_section(VflConfig, "vfl", None, ["resnet_depth=2"])


def test_user_callables_by_name_and_by_object() -> None:
    cfg = VflConfig(model=ModelSection(bottom=f"{USER}:bottom", top=f"{USER}:top", embedding_dim=4))
    f = ModelFactory(cfg)
    check_models(f, {"active": 6, "passive": 3})
    bottom, top = f.modules("active", 6)
    assert isinstance(bottom[1], nn.BatchNorm1d) and isinstance(top, nn.Linear)
    from tests.unit import zoo_user_models as um

    g = ModelFactory(VflConfig(model=ModelSection(embedding_dim=4)), um.bottom, um.top)
    check_models(g, {"active": 6, "passive": 3})
    assert g.describe()["model"] == f"{USER}:bottom"
    import pickle

    assert pickle.loads(pickle.dumps(g)).bottom_fn is um.bottom


@pytest.mark.parametrize(("key", "spec", "match"), [
    ("bottom", "no_such_module_xyz:fn", "cannot be imported"),
    ("bottom", f"{USER}:missing", "cannot be imported"),
    ("bottom", f"{USER}:NOT_CALLABLE", "not callable"),
    ("bottom", f"{USER}:raises", "raised RuntimeError: no model today"),
    ("bottom", f"{USER}:wrong_width", r"to \(2, 3\), expected \(2, 4\)"),
    ("top", f"{USER}:fixed_top", r"rejects a \(2, 8\) input"),
])
def test_bad_factories_are_typed_errors_naming_the_value(key: str, spec: str,
                                                         match: str) -> None:
    f = ModelFactory(VflConfig(model=ModelSection(**{key: spec}, embedding_dim=4)))
    with pytest.raises(ModelSpecError, match=match) as ei:
        check_models(f, {"active": 6, "passive": 3})
    assert ei.value.key == f"vfl.model.{key}" and spec in str(ei.value)


def test_probe_leaves_the_torch_rng_alone() -> None:
    torch.manual_seed(1)
    before = torch.get_rng_state()
    check_models(ModelFactory(VflConfig(model=ModelSection(bottom="resnet", resnet_width=8))),
                 {"active": 3, "passive": 3})
    assert torch.equal(before, torch.get_rng_state())


def test_dp_refuses_batchnorm_or_converts_it_to_groupnorm() -> None:
    base = {"model": {"bottom": "resnet", "resnet_norm": "batch", "resnet_width": 8,
                      "resnet_depth": 1}, "dp.mu": 4.0, "epochs": 1}
    with pytest.raises(DpIncompatibleModel, match="BatchNorm1d"):
        check_models(ModelFactory(vfl_config(base)), {"active": 3, "passive": 5})
    # the active bottom may keep its BatchNorm: its records are not the protected ones
    check_models(ModelFactory(vfl_config(base)), {"active": 3})
    conv = ModelFactory(vfl_config({**base, "dp.batchnorm": "groupnorm"}))
    check_models(conv, {"active": 3, "passive": 5})
    passive = conv.bottom("passive", 5)
    kinds = {type(m).__name__ for m in passive.modules()}
    assert "GroupNorm" in kinds and "BatchNorm1d" not in kinds
    assert "BatchNorm1d" in {type(m).__name__ for m in conv.bottom("active", 3).modules()}
    DpSgd(passive, embed_clip_norm=1.0, grad_clip_norm=1.0, noise_multiplier=1.0, seed=0)
    with pytest.raises(ConfigError, match="dropout") as ei:
        check_models(ModelFactory(vfl_config({**base, "model": {
            **base["model"], "resnet_norm": "layer", "resnet_dropout": 0.1}})), {"passive": 5})
    assert ei.value.key == "vfl.model.resnet_dropout"
    with pytest.raises(DpIncompatibleModel):
        batchnorm_to_groupnorm(nn.Sequential(nn.BatchNorm2d(3)))


def _bn_bottom() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def test_batchnorm_running_stats_are_in_the_ps_vector_and_averaged() -> None:
    torch.manual_seed(0)
    proto = _bn_bottom()
    n_par = sum(p.numel() for p in proto.parameters())
    flat = flat_params([proto])
    assert flat.numel() == n_par + 8  # + running_mean, running_var (num_batches_tracked: int)
    assert torch.equal(flat[n_par:], torch.cat([torch.zeros(4), torch.ones(4)]))
    ps = ParameterServer(flat, workers=2)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 3, generator=g)
    workers = [PassiveCompute(x + 3.0 * k, _bn_bottom, ps, lr=1e-2, delta_t0=1,
                              sync_mode="manual") for k in range(2)]
    stats = []
    for w in workers:
        assert w.bottom.training
        graph, _ = w.forward(np.arange(64))
        w.backward(graph, np.ones((64, 2), np.float32), epoch=0)
        rm = w.bottom[1].running_mean
        # the running statistics are views of the replica's flat vector
        assert torch.equal(w.replica.flat[n_par:n_par + 4], rm)
        stats.append(rm.clone())
    assert not torch.equal(stats[0], stats[1])
    for w in workers:
        w.replica.push()
    theta = ps.pull()
    torch.testing.assert_close(theta[n_par:n_par + 4], (stats[0] + stats[1]) / 2,
                               rtol=0, atol=1e-6)
    # scoring: loaded with the parameters, eval mode uses the averaged running statistics
    scorer = _bn_bottom()
    load_flat([scorer], theta)
    torch.testing.assert_close(scorer[1].running_mean, (stats[0] + stats[1]) / 2,
                               rtol=0, atol=1e-6)
    one_row = embed(scorer, x[:1])
    assert not scorer.training
    torch.testing.assert_close(torch.from_numpy(one_row), scorer(x[:1]), rtol=0, atol=0)
    with pytest.raises(ValueError, match="parameter vector"):
        load_flat([scorer], theta[:-1])


def test_replica_trains_in_train_mode_and_embed_uses_eval_mode() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
    m.eval()
    Replica([m], ParameterServer(flat_params([m])), lr=1e-3, delta_t0=1)
    assert m.training
    x = torch.ones(50, 3)
    a, b = embed(m, x), embed(m, x)
    assert not m.training and np.array_equal(a, b)  # dropout off: deterministic
