"""Small shared helpers: safe file writing, checkpoint/weights loading, timing, YAML recipes, run logs."""
