"""The laya family."""
