"""`raysim report`: runs read back from their directories, drawn as PNG plots and one
self-contained report.html."""
