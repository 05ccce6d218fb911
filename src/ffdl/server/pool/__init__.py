"""The elastic API pool (``ffdl up --workers MIN..MAX``), after ElasticRMI: one address
served by a pool of worker processes whose number follows the load.

gunicorn is the process manager (its arbiter forks, watches and retires workers); each
worker is uvicorn-worker's ``UvicornWorker`` running a whole ffdl app built after the fork.

- ``policy``: the pure rule from load signals to the pool's next size;
- ``counters``: each worker's load counters (an ASGI middleware) and their publisher;
- ``signals``: the controller's measure of the pool over a window, from those counters;
- ``worker``: the gunicorn worker that drains when retired and rebalances connections;
- ``master``: the gunicorn application and the controller thread that resizes it;
- ``files``, ``config``, ``view``: the run directory, the settings' policy, and the view
  ``/v1/cluster/pool`` serves.
"""
