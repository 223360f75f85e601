"""The cua_s1 family."""
