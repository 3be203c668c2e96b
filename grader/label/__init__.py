"""``grader label``: a local page that shows a person the graded rows one at a time, in a
seeded random order, and appends each score they give to a labels file (grader.io.labels).

:mod:`grader.label.session` holds the rows and the labels (every input check before the page
is served), :mod:`grader.label.server` serves the page, :mod:`grader.label.estimate` is the
interval the page shows as labels come in.
"""
