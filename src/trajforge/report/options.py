"""What a report may hold: how many trajectories, how much text each, how big the file."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ReportOptions(BaseModel):
    """Bounds that keep a report of a million-sample run as quick to open as one of ten.

    The statistics and charts always cover every line; only the trajectory browser is bounded.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_trajectories: int = Field(
        2000,
        ge=0,
        le=100_000,
        description="trajectories embedded for the browser (sampled within each status when the run has more)",
    )
    max_text_chars: int = Field(
        4000,
        ge=200,
        description="longest text kept of one think block, message, tool call or tool result (head and tail kept)",
    )
    max_bytes: int = Field(
        25_000_000,
        ge=500_000,
        description="the largest the HTML file may grow; trajectories are left out (at random) beyond it",
    )
    seed: int = Field(0, description="seed of the sampling, so the same run gives the same report")
