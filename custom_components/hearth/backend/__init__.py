"""The server behind an engine entry: Hearth's engine or any OpenAI-compatible one."""
