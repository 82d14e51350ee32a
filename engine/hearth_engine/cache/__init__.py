"""The prefix cache: radix tree, KV budget, prefix store on disk. No request knowledge."""
