"""``grader label``: a local page that shows a person the graded rows one at a time, in a
seeded random order, and appends each score they give to a labels file (grader.io.labels).
"""
