"""The fake engine's damage spec (KVEVAL_FAKE_DAMAGE): kveval's own test format, read into a model."""
from __future__ import annotations

import pydantic
import pytest

from kveval.worker.fake_engine import Damage, Engine, EngineSettings, _Config

CONFIG = _Config(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, hidden_size=64,
                 max_position_embeddings=2048)


def _engine(kv: str, damage: dict, keep: list[str] = ()) -> Engine:
    settings = EngineSettings(model="m", kv_cache_dtype=kv, max_model_len=1024, seed=0,
                              kv_cache_dtype_skip_layers=list(keep))
    return Engine(settings, CONFIG, Damage.model_validate(damage))


def test_fp8_noise_is_the_base_plus_the_layers_not_kept():
    assert _engine("auto", {"fp8_noise": 0.3}).noise == 0.0
    assert _engine("fp8", {}).noise == pytest.approx(0.15)
    assert _engine("fp8", {"fp8_noise": 0.1, "layers": {"1": 0.5, "2": 0.25}}).noise == pytest.approx(0.85)
    assert _engine("fp8", {"fp8_noise": 0.1, "layers": {"1": 0.5, "2": 0.25}}, keep=["1"]).noise == pytest.approx(0.35)


def test_loop_rates_fall_back_to_autos():
    assert _engine("fp8", {"loops": {"auto": 0.1, "fp8": 0.3}}).loop_rate == 0.3
    assert _engine("fp8", {"loops": {"auto": 0.1}}).loop_rate == 0.1
    assert _engine("auto", {"loops": {"fp8": 0.3}}).loop_rate == 0.0


def test_a_misspelt_key_is_refused_not_ignored():
    with pytest.raises(pydantic.ValidationError, match="fp8_nosie"):
        Damage.model_validate({"fp8_nosie": 0.3})
