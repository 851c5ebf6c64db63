"""The studies behind the result documents, and their generators: not part of the installed package.

Run from the repository root as ``python -m studies.<name>`` (each document under ``docs/`` names its command
at its top; the ``bench/*_study.sh`` scripts run the studies and then the generators):

* ``privacy_utility`` — every method at ε = 1, 3, 8 per site, tuned on the validation split
(docs/privacy_utility.md);
* ``tabular`` — the Palmer penguins study (one site per island), then ``tabular_doc`` (docs/tabular.md);
* ``epsilon_check`` — every method's printed ε beside dp-accounting's recomputation;
* ``audit_doc``, ``client_dp_doc``, ``combination_doc``, ``proxyfl_doc``, ``pubsub_doc``, ``results_doc`` —
the
  generators of docs/audit.md, client_dp.md, combination.md, proxyfl.md, pubsub.md and results.md from the run
  and
  report folders of their bench/ scripts.

They need silofl installed with the ``studies`` extra (``pip install -e '.[studies]'``; ``.[all]`` includes
it).
"""
