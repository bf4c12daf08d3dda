"""Adapters from trajforge environments to external trainers (optional extras).

Each adapter module imports its trainer library at the top, so import one only when that extra
is installed; the pure data conversions live in modules of their own that import nothing of it.
"""
