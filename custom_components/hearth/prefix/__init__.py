"""The stable house prefix of an agent: rendered, sized, and told as changes."""
