"""Tool-call parse throughput per parser on long (~100 KB) model outputs.

Run: ``.venv/bin/python benchmarks/parse_throughput.py [--kb 100] [--seconds 0.3]``

For each family, builds a long output (prose paragraphs with that family's calls spread through
it, written by the parser's own ``format_calls``), parses it repeatedly and prints calls/s and
MB/s. The ``x4`` column parses a 4x longer text and reports its time ratio to the base size:
about 4 means linear; 16 would mean quadratic. A second table does the same for adversarial
texts: thousands of calls cut off before their end, where a naive "find the end from every
start" parser goes quadratic. For the families whose values are raw text between tags each cut
call is left inside an open value, so every one of them is also read again past its end tag (a
value may hold it); for the JSON families each one is a failed JSON decode.
"""

from __future__ import annotations

import argparse
import time

from trajforge.llm.parsers import ParsedCall, get_parser, list_parsers

PROSE = (
    "The build failed on the integration step, so I will look at the logs and the configuration "
    "before changing anything. Unicode is fine too: café, naïve, 東京, emoji 🙂. "
)
CALL = ParsedCall(
    "run_command",
    {
        "command": "grep -rn 'TODO' src/ | head -n 20",
        "timeout": 30,
        "env": {"LANG": "C.UTF-8", "paths": ["/a", "/b"]},
    },
)


def build_text(family: str, target_bytes: int) -> tuple[str, int]:
    """A ~target_bytes output with one call after every ~1 KB of prose; returns (text, calls)."""
    writer = get_parser("hermes" if family == "auto" else family)
    call_text = writer.format_calls([CALL])
    paragraph = PROSE * 6
    parts: list[str] = []
    size = calls = 0
    while size < target_bytes:
        chunk = f"{paragraph}\n{call_text}\n"
        parts.append(chunk)
        size += len(chunk.encode())
        calls += 1
    return "".join(parts), calls


def adversarial_text(family: str, target_bytes: int) -> str:
    """Many cut-off call starts followed by one good call: worst case for end-marker searches."""
    parser = get_parser("hermes" if family == "auto" else family)
    start = {
        "llama3_json": '{"name": "f", "parameters": {"a": ',
        "pythonic": "\n[f(a=",
        "deepseek_v3": "<｜tool▁call▁begin｜>x ",
        "deepseek_v31": "<｜tool▁call▁begin｜>x ",
        "kimi_k2": "<|tool_call_begin|>x ",
        "qwen3_coder": "<tool_call>\n<function=f>\n<parameter=a>\nx ",
        "glm45": "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>x ",
        "glm47": "<tool_call>f<arg_key>a</arg_key><arg_value>x ",
        "mistral": '[TOOL_CALLS] [{"name": "f", "arguments": {"a": ',
    }.get(family, parser.start_marker + '{"name": "f", "arguments": {"a": ')
    good = parser.format_calls([CALL])
    return start * max(1, target_bytes // len(start.encode())) + "\n" + good


def time_parse(family: str, text: str, tools: list, seconds: float) -> tuple[float, int]:
    """CPU seconds per parse (best of runs lasting ``seconds``) and calls + errors found.

    CPU time of this process, not wall time, so other work on a shared machine does not skew it.
    """
    parser = get_parser(family)
    result = parser.parse(text, tools)
    best = float("inf")
    deadline = time.process_time() + seconds
    runs = 0
    while runs < 5 or time.process_time() < deadline:
        t0 = time.process_time()
        parser.parse(text, tools)
        best = min(best, time.process_time() - t0)
        runs += 1
    return best, len(result.calls) + len(result.errors)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_command",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string"},
                    "timeout": {"type": "integer"},
                    "env": {"type": "object"},
                },
            },
        },
    }
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kb", type=int, default=100, help="size of the base output in KB")
    ap.add_argument("--seconds", type=float, default=0.3, help="time budget per measurement")
    args = ap.parse_args()
    size = args.kb * 1024

    print(f"Parse throughput on ~{args.kb} KB outputs (one call per ~1 KB of prose)")
    print(f"{'parser':<14}{'KB':>7}{'calls':>7}{'ms/parse':>10}{'calls/s':>12}{'MB/s':>9}{'x4 time':>9}")
    for family in list_parsers():
        text, calls = build_text(family, size)
        sec, found = time_parse(family, text, TOOLS, args.seconds)
        assert found == calls, f"{family}: expected {calls} calls, parsed {found}"
        big, _ = build_text(family, 4 * size)
        sec4, _ = time_parse(family, big, TOOLS, args.seconds)
        mb = len(text.encode()) / 1e6
        print(
            f"{family:<14}{len(text.encode()) / 1024:>7.0f}{calls:>7}{sec * 1e3:>10.2f}"
            f"{calls / sec:>12,.0f}{mb / sec:>9.1f}{sec4 / sec:>9.1f}"
        )

    print(f"\nAdversarial: ~{args.kb} KB of cut-off call starts, then one good call")
    print(f"{'parser':<14}{'starts':>8}{'ms/parse':>10}{'MB/s':>9}{'x4 time':>9}")
    for family in list_parsers():
        text = adversarial_text(family, size)
        sec, found = time_parse(family, text, TOOLS, args.seconds)
        sec4, _ = time_parse(family, adversarial_text(family, 4 * size), TOOLS, args.seconds)
        print(
            f"{family:<14}{found:>8}{sec * 1e3:>10.2f}{len(text.encode()) / 1e6 / sec:>9.1f}{sec4 / sec:>9.1f}"
        )


if __name__ == "__main__":
    main()
