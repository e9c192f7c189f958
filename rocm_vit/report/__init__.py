"""``rocm-vit report``: the parts it runs (``parts``), the hazard self-checks (``hazards``, with their
real probes in ``probes``), the document they make (``collect``) and its markdown (``render``)."""
