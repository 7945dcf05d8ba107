"""The config sections every algorithm shares, and the strict base of every config model.

A leaf: the algorithms, the pipeline and the flows import it; it imports none of them
(``tests/test_import_contracts.py`` holds the rule), so an algorithm's config never drags in
the layers above it, and its schema loads without torch.
"""
