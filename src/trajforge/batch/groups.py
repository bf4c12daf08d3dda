"""``--group-size N``: each dataset row becomes N samples, keyed ``ROWKEY#k``.

A view over the dataset index with the interface the planner and the workers use: the run's
sample keys are the row keys with ``#0`` .. ``#N-1``, each a sample of its own (its own seed,
derived from its key; its own sandbox; its own ledger entry), and ``prompt_index`` on every line
is the row's index, so a group of lines with one ``prompt_index`` are the samples of one prompt
(what DPO pairing by reward and GRPO-style grouping read). N is fixed for a run (a resume with
another N is refused). A bad row fails as each of its N samples, with its reason.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace

from trajforge.batch.dataset import BadRow, DatasetIndex, Sample
from trajforge.record.keys import rollout_key


@dataclass(eq=False)
class GroupedIndex:
    base: DatasetIndex
    per_prompt: int
    keys: list[str] = field(init=False)

    def __post_init__(self) -> None:
        if self.per_prompt < 2:
            raise ValueError("a grouped index needs at least 2 samples per prompt (1 is the plain index)")
        n = self.per_prompt
        self.keys = [rollout_key(key, k, n) for key in self.base.keys for k in range(n)]

    @property
    def total_rows(self) -> int:
        return len(self.keys)

    @property
    def bad(self) -> dict[int, str]:
        n = self.per_prompt
        return {row * n + k: reason for row, reason in self.base.bad.items() for k in range(n)}

    def fingerprint(self, rows: int) -> str:
        return hashlib.blake2b("\n".join(self.keys[:rows]).encode("ascii"), digest_size=20).hexdigest()

    def samples(self, indexes: list[int]) -> tuple[list[Sample], list[BadRow]]:
        n = self.per_prompt
        good: list[Sample] = []
        bad: list[BadRow] = []
        for i in indexes:
            row, k = divmod(i, n)
            if row in self.base.bad:
                bad.append(replace(self.base.bad_row(row), key=self.keys[i]))
            else:
                good.append(replace(self.base.sample(row), key=self.keys[i], sample_index=k))
        return good, bad

    def forget_parsed(self) -> None:
        self.base.forget_parsed()
