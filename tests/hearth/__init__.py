"""Tests for the Hearth Home Assistant integration."""
