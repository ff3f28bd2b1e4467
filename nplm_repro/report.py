"""`nplm-report`: a study's runs in MLflow -> the paper-style table (md, tex, csv, html) and figures."""

from nplm_repro.reporting.report_all import main

if __name__ == "__main__":
    main()
