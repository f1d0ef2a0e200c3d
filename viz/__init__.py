"""Plotly figures: arrays in, go.Figure out; no streamlit here."""
from .figures import head_grid, head_heatmap, safe, text_shading, token_lines
from .grids import overview, overview_png, reach_grid, role_grid

__all__ = ["head_grid", "head_heatmap", "overview", "overview_png", "reach_grid", "role_grid", "safe", "text_shading", "token_lines"]
