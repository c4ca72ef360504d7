"""`graft tune`: serve traces (format, synthetic ones), their replay against candidate engine
configurations, and the search for the best configuration under an SLO."""
