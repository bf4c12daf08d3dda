"""``trajforge serve`` loads LoRA adapters between steps: ``/v1/load_weights`` of an adapter
directory merges it onto the base the server started from (serve/adapters.py).

A real server process on loopback, a tiny Qwen2 and a real peft adapter trained one step. Checked:
the served distribution after the load is exactly the merged model's (so the adapter reached the
weights), a second adapter is merged onto the base and not onto the first merge, and what must be
refused is: an adapter of another base, and an adapter saved as a pickle.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from trajforge.rl import fit
from trajforge.rl.config import TrainConfig
from trajforge.serve.adapters import check_adapter, is_adapter_dir
from trajforge.testing.tiny import build_tiny_model, build_tiny_tokenizer

pytestmark = pytest.mark.timeout(300)


def _adapter(base: Path, out: Path, seed: int) -> Path:
    """A LoRA policy of ``base`` with random non-zero B, saved as a checkpoint (adapter + merged)."""
    cfg = TrainConfig(env="x", model=base, lora={"r": 4, "alpha": 8.0})
    model = fit.load_policy(cfg, base, "cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    out.mkdir(parents=True)
    fit.save_policy(model, out)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    tok = build_tiny_tokenizer(root / "tok", "chatml")
    build_tiny_model(root / "base", tok, hidden=32, layers=2, seed=0)
    build_tiny_model(root / "other", tok, hidden=32, layers=2, seed=1)
    return {
        "base": root / "base",
        "other": root / "other",
        "one": _adapter(root / "base", root / "one", 1),
        "two": _adapter(root / "base", root / "two", 2),
        "foreign": _adapter(root / "other", root / "foreign", 3),
    }


def _merged_logprobs(model_dir: Path, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)


async def _generate(base_url: str, ids: list[int]) -> tuple[int, float, int]:
    import aiohttp

    body = {"prompt": {"prompt_token_ids": ids}, "max_tokens": 1, "temperature": 0.0, "logprobs": 0}
    async with aiohttp.ClientSession() as s, s.post(f"{base_url}/generate", json=body) as resp:
        data = await resp.json()
        assert resp.status == 200, data
    token = data["token_ids"][0][0]
    return token, float(data["logprobs"][0][0][0][str(token)]), int(data["model_version"])


async def _load(server: Any, path: Path) -> tuple[int, Any]:
    import aiohttp

    async with (
        aiohttp.ClientSession() as s,
        s.post(
            f"{server.base_url}/v1/load_weights", json={"path": str(path)}, headers=server.auth_headers()
        ) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


def test_the_server_merges_adapters_onto_its_base(models: dict[str, Path], tmp_path: Path) -> None:
    from trajforge.serve.launcher import LocalServer

    ids = [1, 7, 9, 30, 41, 5]
    pickled = tmp_path / "pickled"
    shutil.copytree(models["one"] / "adapter", pickled)
    (pickled / "adapter_model.safetensors").rename(pickled / "adapter_model.bin")

    async def scenario() -> None:
        async with LocalServer(models["base"], device="cpu") as server:
            assert server.base_url is not None
            for name in ("one", "two", "one"):  # each merged onto the base, never onto the last merge
                status, body = await _load(server, models[name] / "adapter")
                assert status == 200, body
                token, lp, version = await _generate(server.base_url, ids)
                assert version == body["version"]
                expected = _merged_logprobs(models[name], ids)
                assert int(expected.argmax()) == token
                assert lp == pytest.approx(float(expected[token]), abs=1e-4)
            versions = version
            # refused, and the served weights stay those of the last load
            for bad in (models["foreign"] / "adapter", pickled):
                status, body = await _load(server, bad)
                assert status == 400, body
            token, lp, version = await _generate(server.base_url, ids)
            assert version == versions
            assert lp == pytest.approx(float(_merged_logprobs(models["one"], ids)[token]), abs=1e-4)

    asyncio.run(scenario())


def test_adapter_checks_say_why(models: dict[str, Path], tmp_path: Path) -> None:
    adapter = models["one"] / "adapter"
    assert (
        is_adapter_dir(adapter) and not is_adapter_dir(models["one"]) and not is_adapter_dir(models["base"])
    )
    assert check_adapter(adapter, models["base"])["peft_type"] == "LORA"
    with pytest.raises(ValueError, match="was trained on .* start the server on that base"):
        check_adapter(models["foreign"] / "adapter", models["base"])
    other = tmp_path / "ia3"
    shutil.copytree(adapter, other)
    config = json.loads((other / "adapter_config.json").read_text())
    (other / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "IA3"}))
    with pytest.raises(ValueError, match="not a LoRA adapter"):
        check_adapter(other, models["base"])
