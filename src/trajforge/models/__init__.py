"""Models trajforge builds and ships itself (the embedded tiny tool-calling policy)."""
