"""Lag and backlog reports over the Parquet samples that ``mqgw snapshot`` writes.

- :mod:`gateway.reports.job`: the ``mqgw report`` command (also a ``spark-submit`` script).
- :mod:`gateway.reports.lag`: the Spark computations (built-in SQL and window functions only).
- :mod:`gateway.reports.figures`: what each chart shows (from the job's result), and
  :mod:`gateway.reports.buckets`: the heat map's time buckets (a real gap vs jitter).
- :mod:`gateway.reports.rates`: each consumer against the production of the topics it reads.
- :mod:`gateway.reports.charts`, :mod:`gateway.reports.render`: PNG charts and the HTML page
  (its sections; :mod:`gateway.reports.cells` its cells and tables, ``report.css`` its style,
  :mod:`gateway.reports.formatting` the text of figures, times and durations).
- :mod:`gateway.reports.synth`: synthetic snapshot writers (tests, bench). The input format is
  :mod:`gateway.core.snapshot_format`, shared with ``mqgw snapshot``.

Needs the ``reports`` extra (pyspark, pyarrow, pandas, matplotlib) and Java 17+.
"""
