"""The jemm family."""
