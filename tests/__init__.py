"""Test suite; tests.fakes holds reusable fakes (importable as tests.fakes.*)."""
