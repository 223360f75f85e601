"""The omnijev family."""
