want = [
    "- [Getting Started](#getting-started)",
    "  - [Install (Linux & macOS)](#install-linux--macos)",
    "  - [First run!](#first-run)",
    "- [API Reference](#api-reference)",
    "  - [`run()` options](#run-options)",
    "- [FAQ / Troubleshooting](#faq--troubleshooting)",
]
got = open("/app/toc.md").read().splitlines()
assert got == want, got
