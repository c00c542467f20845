SELECT sendonce_suppression_analyze()
