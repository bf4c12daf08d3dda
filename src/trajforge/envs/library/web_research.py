"""``web_research``: answer a question from pages reached with ``web_search`` / ``web_extract``.

Items are ``{"id", "question", "answer", "aliases"?, "url"?, "category"?}`` (a shipped file of
ten; ``dataset_file`` replaces it). The env needs the web tools, named by its config (``tools``
inline or ``tools_config``: a YAML file like batch's ``--tools-config``); without a search
provider it refuses to start and says how to configure one.

Reward (from the messages alone, so ``env rescore`` needs nothing kept):

- correctness: 1.0 when the normalized answer equals the normalized expected answer or an alias;
  ``contains_credit`` (0.8) when a short answer (at most ``max_answer_words``) contains one as
  whole words and the rest of it only restates the question (no other number, no "or"/"and"
  list, no word absent from the question but a few fillers: :func:`restates`); else 0. An
  answer that lists candidates earns nothing. Normalization: lower case, punctuation and thousands separators removed,
  articles dropped, whitespace collapsed. The answer is the text after the last ``Answer:``
  of the final message (the whole message when there is none).
- citation: the final message names a URL that a ``web_extract`` call of this rollout fetched
  successfully. reward = correctness x (1 - citation_weight + citation_weight x cited).
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, model_validator

from trajforge.envs.base import BaseEnv, EnvDataError, _read_items
from trajforge.envs.config import EnvConfig
from trajforge.envs.types import Item, RewardBreakdown
from trajforge.tools.config import ToolsConfig, load_tools_config, parse_tools_config

if TYPE_CHECKING:
    from trajforge.agent.result import AgentResult
    from trajforge.envs.verifier import VerifierContext
    from trajforge.tools.registry import ToolRegistry

ITEMS_FILE = Path(__file__).with_name("web_research_items.jsonl")

SYSTEM = (
    "You answer questions by research on the web. Use web_search to find pages and web_extract "
    "to read them. Base the answer on a page you read. End with two lines:\n"
    "Answer: <the short answer>\nSource: <the URL of the page you read it on>"
)

HOW_TO_CONFIGURE = (
    "web_research needs the web tools: give a search provider in the env config, either inline "
    "(tools: {web: {provider: searxng, endpoint: 'http://127.0.0.1:8888'}}) or as a tools YAML file "
    "(tools_config: path/to/tools.yaml, the same file as `trajforge batch --tools-config`); brave and "
    "tavily read their key from BRAVE_API_KEY / TAVILY_API_KEY. Pass the env config with "
    "`trajforge env eval web_research --config env.yaml`."
)


class WebResearchConfig(EnvConfig):
    # the env's defaults as field defaults too: a YAML config (`env eval --config`) starts from them
    enabled_toolsets: list[str] | None = Field(["web"], description="toolsets offered to every rollout")
    max_agent_turns: int = Field(10, ge=1, description="model calls per rollout")
    group_size: int = Field(2, ge=1, description="rollouts per item (GRPO group)")

    @model_validator(mode="before")
    @classmethod
    def _distribution_replaces_default_toolsets(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("distribution") is not None and "enabled_toolsets" not in data:
            return {**data, "enabled_toolsets": None}
        return data

    tools: dict[str, Any] | None = Field(None, description="the tools section (web provider, network policy)")
    tools_config: str | None = Field(None, description="a tools YAML file (exclusive with tools)")
    contains_credit: float = Field(0.8, ge=0.0, le=1.0, description="credit for a short answer containing it")
    max_answer_words: int = Field(12, ge=1, description="longest answer that earns contains credit")
    citation_weight: float = Field(
        0.2, ge=0.0, le=1.0, description="share of the reward for citing a fetched URL"
    )

    @model_validator(mode="after")
    def _one_tools_source(self) -> WebResearchConfig:
        if self.tools is not None and self.tools_config is not None:
            raise ValueError("tools and tools_config are exclusive: keep one")
        if self.tools is not None:
            parse_tools_config(self.tools)  # a bad section fails here, naming the key
        return self


class WebResearchEnv(BaseEnv[WebResearchConfig]):
    name: ClassVar[str] = "web_research"
    description: ClassVar[str] = (
        "questions answered from pages reached with web_search/web_extract (needs a search provider)"
    )
    config_class: ClassVar[type[EnvConfig]] = WebResearchConfig
    default_system_prompt: ClassVar[str | None] = SYSTEM

    @classmethod
    def default_config(cls) -> EnvConfig:
        return WebResearchConfig()

    @property
    def _cfg(self) -> WebResearchConfig:
        return self.config

    def tools_config(self) -> ToolsConfig:
        """The tools this env runs with (what ``tool_registry`` builds)."""
        cfg = self._cfg
        if cfg.tools_config is not None:
            return load_tools_config(Path(cfg.tools_config))
        return parse_tools_config(cfg.tools)

    def tool_registry(self) -> ToolRegistry:
        """A registry with the configured web tools (the caller closes it); ``env eval`` uses it
        instead of the default registry."""
        from trajforge.tools.builtin import build_registry

        return build_registry(self.tools_config())

    def web_unready(self) -> str | None:
        """Why the env cannot run here (with how to fix it), or None."""
        why = self.tools_config().web_config().search_unready()
        return f"{why}. {HOW_TO_CONFIGURE}" if why else None

    async def setup(self) -> None:
        why = self.web_unready()
        if why is not None:
            raise EnvDataError(why)
        await super().setup()
        if self._items is None:
            self._items = _read_items(ITEMS_FILE)
        for item in self._items:
            if not item.get("question") or not item.get("answer"):
                raise EnvDataError(f"web_research item {self.item_id(item)} needs 'question' and 'answer'")

    def eval_items(self, n: int) -> list[Item]:
        if self._items is None:
            self._items = _read_items(ITEMS_FILE)
        return self._items[:n]

    def format_prompt(self, item: Item) -> str:
        return str(item["question"])

    async def compute_reward(self, item: Item, result: AgentResult, ctx: VerifierContext) -> RewardBreakdown:
        return self.judge(item, result.messages)

    async def rescore(
        self, item: Item, messages: list[dict[str, Any]], kept: dict[str, Any]
    ) -> RewardBreakdown:
        return self.judge(item, messages)

    def judge(self, item: Item, messages: list[dict[str, Any]]) -> RewardBreakdown:
        cfg = self._cfg
        final = _final_answer(messages)
        given = _answer_part(final)
        expected = [str(item["answer"]), *map(str, item.get("aliases") or [])]
        norm_given = normalize(given)
        targets = [t for t in (normalize(e) for e in expected) if t]
        exact = norm_given in targets
        short = len(norm_given.split()) <= cfg.max_answer_words
        contains = short and not exact and restates(norm_given, targets, str(item.get("question", "")))
        correct = 1.0 if exact else cfg.contains_credit if contains else 0.0
        fetched = fetched_urls(messages)
        cited = sorted(u for u in cited_urls(final) if _url_key(u) in fetched)
        searched = any(_calls(messages, "web_search"))
        w = cfg.citation_weight
        reward = correct * (1.0 - w + w * float(bool(cited)))
        verdict = "exact" if exact else "contains" if contains else "wrong"
        return RewardBreakdown(
            value=reward,
            components={
                "exact": float(exact),
                "contains": float(contains),
                "cited_fetched": float(bool(cited)),
                "fetched": float(len(fetched)),
                "searched": float(searched),
            },
            reason=f"answer {given[:80]!r}: {verdict}; cited fetched: {cited[:3] or 'none'}",
        )

    def oracle_calls(self, item: Item) -> list[tuple[str, dict[str, Any]]]:
        """Read the item's source page (items with a ``url``)."""
        if not item.get("url"):
            raise ValueError(f"item {self.item_id(item)} has no 'url': no oracle")
        return [("web_extract", {"urls": [item["url"]]})]

    def oracle_answer(self, item: Item, messages: list[dict[str, Any]]) -> str:
        return f"Answer: {item['answer']}\nSource: {item['url']}"


# ---------------------------------------------------------------------------------------------


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans({c: " " for c in string.punctuation if c not in ".,"})


def normalize(text: str) -> str:
    """Lower case; thousands separators and punctuation out (a decimal point kept), articles
    dropped, whitespace collapsed."""
    text = text.lower().strip()
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)  # 8,848.86 -> 8848.86
    text = re.sub(r"(?<!\d)[.,]|[.,](?!\d)", " ", text)  # keep only the decimal point of numbers
    text = text.translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


_FILLER = frozenset(
    [
        "in",
        "on",
        "at",
        "of",
        "is",
        "was",
        "were",
        "it",
        "its",
        "by",
        "from",
        "year",
        "about",
        "around",
        "approximately",
        "roughly",
        "circa",
        "ca",
        "c",
    ]
)
_LIST_WORDS = frozenset({"or", "and", "nor", "vs", "versus", "either", "maybe", "perhaps", "possibly"})


def restates(norm_given: str, targets: list[str], question: str) -> bool:
    """Contains credit: the (normalized) answer holds a target as whole words and the rest of it
    only restates the question -- no other number, no list word (or/and/nor/vs, maybe), no word
    that is neither in the question nor a filler ("in", "about", "year", ...). So "rebuilt in
    1911" earns it, and "1887 1888 1889" or "Guido van Rossum or Larry Wall" does not: an answer
    listing candidates is not the answer."""
    allowed = set(normalize(question).split()) | _FILLER
    for target in targets:
        for m in re.finditer(rf"(?<!\S){re.escape(target)}(?!\S)", norm_given):
            rest = (norm_given[: m.start()] + " " + norm_given[m.end() :]).split()
            if any(c.isdigit() for w in rest for c in w) or _LIST_WORDS & set(rest):
                continue
            if set(rest) <= allowed:
                return True
    return False


def _final_answer(messages: list[dict[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "assistant" and not m.get("tool_calls"):
            return str(m.get("content") or "")
    return ""


def _answer_part(final: str) -> str:
    found = list(re.finditer(r"(?im)^\s*\**answer\**\s*:\s*(.*)$", final))
    if found:
        return found[-1].group(1).strip()
    lines = [ln for ln in final.splitlines() if not re.match(r"(?i)^\s*sources?\s*:", ln)]
    return "\n".join(lines).strip()


_URL = re.compile(r"https?://[^\s<>\"')\]]+")


def cited_urls(text: str) -> set[str]:
    return {u.rstrip(".,;:") for u in _URL.findall(text)}


def _url_key(url: str) -> str:
    return url.strip().rstrip("/")


def _calls(messages: list[dict[str, Any]], tool: str) -> list[str]:
    """The ids of the calls of ``tool`` in the conversation."""
    ids = []
    for m in messages:
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            if fn.get("name") == tool:
                ids.append(str(call.get("id")))
    return ids


def fetched_urls(messages: list[dict[str, Any]]) -> set[str]:
    """URLs (as asked and after redirects) that this rollout's ``web_extract`` calls read."""
    ids = set(_calls(messages, "web_extract"))
    out: set[str] = set()
    for m in messages:
        if m.get("role") != "tool" or str(m.get("tool_call_id")) not in ids:
            continue
        try:
            body = json.loads(str(m.get("content") or ""))
        except json.JSONDecodeError:
            continue
        for r in body.get("results", []) if isinstance(body, dict) else []:
            if isinstance(r, dict) and "error" not in r and r.get("content"):
                out.update(_url_key(str(r[k])) for k in ("url", "final_url") if r.get(k))
    return out
