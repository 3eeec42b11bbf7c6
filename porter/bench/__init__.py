"""Benchmarks: printed figures for speed and memory, never asserted by a unit test."""
