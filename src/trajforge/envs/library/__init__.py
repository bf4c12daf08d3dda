"""The environments shipped with trajforge (looked up through :mod:`trajforge.envs.catalog`)."""
