"""The cost model: pure numpy, vectorised over candidate configurations; no solver imports."""
