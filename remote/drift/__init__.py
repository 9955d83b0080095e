"""Static drift analysis of a consumer package against the provider package it drives.

Standard library only; the provider is read with `ast`, never imported.
Entry point: drift.analyzer.analyze().
"""
