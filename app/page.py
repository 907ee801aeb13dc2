"""The script `streamlit run` executes (see crossover.app.cli); all of the page is in crossover.app.ui."""

from crossover.app.ui import main

main()
