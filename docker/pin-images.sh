#!/usr/bin/env bash
# Refresh the base-image digests of docker/Dockerfile.* from their tags (needs registry access and one of
# `docker buildx`, `crane` or `skopeo`). Rewrites each `ARG NAME=image:tag@sha256:...` default in place;
# review and commit the diff, then rebuild.
#   docker/pin-images.sh            # every Dockerfile
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

digest() {  # image:tag -> sha256:... of the tag's manifest list (index), as `docker pull` resolves it
    if docker buildx version >/dev/null 2>&1; then
        docker buildx imagetools inspect "$1" --format '{{json .Manifest}}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["digest"])'
    elif command -v crane >/dev/null; then
        crane digest "$1"
    elif command -v skopeo >/dev/null; then
        skopeo inspect --format '{{.Digest}}' "docker://$1"
    else
        echo "pin-images: need docker buildx, crane or skopeo" >&2; exit 1
    fi
}

for f in Dockerfile.*; do
    grep -E '^ARG [A-Z_]+=[^ ]+@sha256:[0-9a-f]{64}$' "$f" | while IFS= read -r line; do
        ref=${line#*=}
        tag=${ref%@*}
        new=$(digest "$tag")
        [[ $new =~ ^sha256:[0-9a-f]{64}$ ]] || { echo "pin-images: no digest for $tag" >&2; exit 1; }
        sed -i "s|${ref}|${tag}@${new}|" "$f"
        echo "$f: $tag@$new"
    done
done
