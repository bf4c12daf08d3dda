import json
import os

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "config.json")) as fh:
    cfg = json.load(fh)
print(
    f"{cfg['name']} on {cfg['server']['host']}:{cfg['server']['port']} "
    f"debug={cfg['debug']} workers={cfg['server']['workers']} tags={','.join(cfg['tags'])}"
)
