"""The Typer command-line front; heavy imports live inside command bodies."""
