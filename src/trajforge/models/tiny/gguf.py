"""The tiny policy as GGUF, for llama.cpp's servers (llama-server, llama-cpp-python).

llama.cpp's own ``convert_hf_to_gguf.py`` converts the Qwen2 weights as they are. What it cannot
know is the tokenizer's pre-tokenizer: it names a BPE vocabulary's pre-tokenizer by the hash of
how the tokenizer splits one fixed text, and refuses a hash it has no entry for. Ours is in no list
(:mod:`trajforge.models.tiny.tokenizer`: every space a piece of its own, digits one by one, then
GPT-2's byte-level split), and llama.cpp has no pre-tokenizer that isolates spaces.

It does not need one. No merge of our vocabulary holds a space byte (``Ġ``): a space was never
beside anything in training, so BPE never joins it to a neighbour, and a piece ``" word"`` becomes
``Ġ`` + the tokens of ``"word"`` exactly as the pieces ``" "`` and ``"word"`` would. What is left
of our split -- digits one by one, then GPT-2's pattern -- is llama.cpp's ``starcoder``
pre-tokenizer. This module checks both facts on the tokenizer it converts (a retrained tokenizer
that breaks them is refused, not converted wrong), then runs the converter with that one answer
given for our tokenizer. Nothing in llama.cpp is edited; the tests compare llama-server's
tokenization with ours on the policy's own texts.

    python -m trajforge.models.tiny.gguf --llama-cpp DIR --out tiny.gguf [--model-dir WEIGHTS]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PRE_TOKENIZER = "starcoder"
"""llama.cpp's name for the split our tokenizer makes (see the module docstring)."""

_OUR_SPLIT = [
    {"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated", "invert": False},
    {"type": "Digits", "individual_digits": True},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
]
_SPACE = "Ġ"  # the byte-level alphabet's space


class NotOurTokenizer(ValueError):
    """The tokenizer is not the one whose split ``starcoder`` reproduces."""


def check_tokenizer(model_dir: Path) -> None:
    """Raise :class:`NotOurTokenizer` unless ``model_dir``'s tokenizer splits as ours and no merge
    holds a space (the two facts that make ``starcoder`` tokenize it identically)."""
    spec = json.loads((model_dir / "tokenizer.json").read_text())
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") != "Sequence" or pre.get("pretokenizers") != _OUR_SPLIT:
        raise NotOurTokenizer(f"{model_dir}/tokenizer.json splits text differently from the tiny policy's")
    merges = (spec.get("model") or {}).get("merges") or []
    for merge in merges:
        pair = merge if isinstance(merge, list) else str(merge).split(" ")
        if any(_SPACE in part for part in pair):
            raise NotOurTokenizer(
                f"merge {merge!r} joins a space to a neighbour: starcoder would split it apart"
            )


@contextlib.contextmanager
def _converter_on_path(llama_cpp: Path) -> Iterator[None]:
    """``conversion`` and the vendored ``gguf`` importable (as the converter script sets them up)."""
    added = [str(llama_cpp), str(llama_cpp / "gguf-py")]
    sys.path[:0] = added
    try:
        yield
    finally:
        for entry in added:
            with contextlib.suppress(ValueError):
                sys.path.remove(entry)


def convert(llama_cpp: Path, model_dir: Path, out: Path, outtype: str = "f32") -> Path:
    """Write ``model_dir`` as GGUF to ``out`` with llama.cpp's converter; returns ``out``."""
    check_tokenizer(model_dir)
    script = llama_cpp / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise FileNotFoundError(f"{script} is missing: is {llama_cpp} a llama.cpp source tree?")
    with _converter_on_path(llama_cpp):
        from conversion.base import TextModel  # llama.cpp's, from the path just added

        def ours(self: Any, tokenizer: Any) -> str:
            return PRE_TOKENIZER

        original = TextModel.get_vocab_base_pre
        TextModel.get_vocab_base_pre = ours  # only for this conversion, of the tokenizer checked above
        argv = sys.argv
        sys.argv = [str(script), str(model_dir), "--outfile", str(out), "--outtype", outtype]
        try:
            runpy.run_path(str(script), run_name="__main__")
        finally:
            sys.argv = argv
            TextModel.get_vocab_base_pre = original
    return out


def main(argv: list[str] | None = None) -> None:
    from trajforge.endpoint import embedded_weights

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree (its converter)")
    parser.add_argument("--out", type=Path, required=True, help="the .gguf file to write")
    parser.add_argument("--model-dir", type=Path, default=None, help="default: the embedded policy")
    parser.add_argument(
        "--outtype", default="f32", help="f32 (default: logprobs as the torch model's), f16, ..."
    )
    args = parser.parse_args(argv)
    try:
        convert(args.llama_cpp, args.model_dir or embedded_weights(), args.out, args.outtype)
    except (NotOurTokenizer, FileNotFoundError) as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
