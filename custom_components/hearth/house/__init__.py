"""What the house has, and what it calls its things, areas and floors."""
