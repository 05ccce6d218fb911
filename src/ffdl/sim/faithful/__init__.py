"""A second comparison engine that follows the rules of Pollux's published simulator
(petuum/adaptdl, branch ``osdi21-artifact``) so that its Pollux, Tiresias and Optimus land
where that simulator's shipped results do, before it ranks ffdl's policy against them.

``traces`` reads the six measured applications, ``goodput`` holds the throughput and
efficiency model the policies plan with, ``engine`` runs jobs and rounds, ``policies`` and
``pollux`` are the three baselines, ``validate`` compares them with the shipped results.
"""
