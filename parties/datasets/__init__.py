"""Bundled datasets (package resources). See README.md in this directory."""
