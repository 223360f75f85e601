"""Benchmarks: a bounded loopback load generator and the comparisons of docs/benchmarks.md."""
