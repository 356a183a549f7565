"""The cost model: pure numpy, vectorised over candidate configurations; no solver imports.

Folders by concept (README.md here lists each module), imported downward only:

    kernels  <  comm  <  layers  <  memory  <  step
                         layers  <  serving

candidates, distinct, row_memo and uncertainty sit at this level and import no folder.
"""
