"""Chat templates, tool-call parsing and control-token escaping."""
