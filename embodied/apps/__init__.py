"""The applications on top of everything: the ``embodied`` command line, the demo pipeline,
collection, labelling and the benches."""
