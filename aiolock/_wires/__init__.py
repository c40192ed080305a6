"""Wire formats shared with other clients: one module per format (see aiolock._wire)."""
