"""Python-backend models. The generated `<model>/1/model.py` files only import `TritonPythonModel`
from here, so the logic is importable and unit-testable without Triton."""
