"""verify's report as one self-contained HTML page (`rocmport report`, verify's --html): reader.py reads
the JSON, source.py the ported tree where it still is, plots.py draws, render.py fills the templates;
and case_results.py, stage 4's results per case of a line kept from reports for docs/cases.md."""
