package command

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/gantry-gpu/gantry/cli/internal/apiclient"
	"github.com/gantry-gpu/gantry/cli/internal/output"
	"github.com/gantry-gpu/gantry/cli/internal/tty"
	"github.com/gantry-gpu/gantry/proto/api"
)

// uriScheme names an object in the project's storage: bucket:NAME/PATH. Anything else
// given to cp is a local path ("-" is stdin or stdout).
const uriScheme = "bucket:"

func (a *app) bucketCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bucket",
		Short: "Manage the current project's storage buckets",
		Example: `  gantry bucket ls
  gantry bucket create datasets
  gantry bucket rm datasets --force`,
	}
	cmd.AddCommand(&cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the project's buckets",
		Example: `  gantry bucket ls
  gantry bucket ls -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, project, err := a.storageSession(cmd.Context())
			if err != nil {
				return err
			}
			items := []api.StorageBucket{}
			var cursor *string
			for {
				res, err := s.API.ListStorageBucketsWithResponse(cmd.Context(), &api.ListStorageBucketsParams{XProjectID: project, Cursor: cursor})
				if err != nil {
					return err
				}
				if err := ok(res.HTTPResponse, res.Body); err != nil {
					return err
				}
				items = append(items, res.JSON200.Items...)
				if cursor = res.JSON200.Pagination.NextCursor; cursor == nil {
					break
				}
			}
			return a.printer().Print(items, func(t *output.TableWriter) { bucketTable(t, items) })
		},
	}, &cobra.Command{
		Use:   "create NAME",
		Short: "Create a bucket in the project",
		Example: `  gantry bucket create datasets
  gantry bucket create checkpoints -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, project, err := a.storageSession(cmd.Context())
			if err != nil {
				return err
			}
			idem := uuid.NewString()
			res, err := s.API.CreateStorageBucketWithResponse(cmd.Context(), &api.CreateStorageBucketParams{XProjectID: project, IdempotencyKey: &idem},
				api.CreateStorageBucketJSONRequestBody{BucketID: args[0]})
			if err != nil {
				return err
			}
			if err := ok(res.HTTPResponse, res.Body); err != nil {
				return err
			}
			return a.printer().Print(res.JSON201, func(t *output.TableWriter) { bucketTable(t, []api.StorageBucket{*res.JSON201}) })
		},
	}, a.bucketRmCmd())
	return cmd
}

func (a *app) bucketRmCmd() *cobra.Command {
	var force bool
	rm := &cobra.Command{
		Use:     "rm NAME",
		Aliases: []string{"remove", "delete"},
		Short:   "Delete a bucket (refused while it holds objects, unless --force)",
		Example: `  gantry bucket rm scratch
  gantry bucket rm datasets --force`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, project, err := a.storageSession(cmd.Context())
			if err != nil {
				return err
			}
			p := &api.DeleteStorageBucketParams{XProjectID: project}
			if force {
				p.Force = &force
			}
			res, err := s.API.DeleteStorageBucketWithResponse(cmd.Context(), args[0], p)
			if err != nil {
				return err
			}
			if err := ok(res.HTTPResponse, res.Body); err != nil {
				return err
			}
			fmt.Fprintf(a.errOut, "Deleted bucket %s.\n", args[0])
			return nil
		},
	}
	rm.Flags().BoolVar(&force, "force", false, "delete the bucket and all its objects")
	return rm
}

func bucketTable(t *output.TableWriter, items []api.StorageBucket) {
	t.Row("BUCKET", "STATE", "OBJECTS", "BYTES", "CREATED")
	for _, b := range items {
		t.Row(b.BucketID, string(b.State), fmt.Sprint(b.ObjectCount), fmt.Sprint(b.SizeBytes), ts(b.CreatedAt))
	}
}

// objectListing is what `gantry ls -o json` prints: folders, then objects.
type objectListing struct {
	Prefixes []string            `json:"prefixes" yaml:"prefixes"`
	Objects  []api.StorageObject `json:"objects" yaml:"objects"`
}

func (a *app) lsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "ls BUCKET[/PREFIX]",
		Short: "List a bucket's objects and folders (one level, '/' separates folders)",
		Example: `  gantry ls datasets
  gantry ls datasets/imagenet/
  gantry ls bucket:datasets/imagenet/ -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			bucket, prefix := splitBucketPath(strings.TrimPrefix(args[0], uriScheme))
			if bucket == "" {
				return usageErr(errors.New("name a bucket: gantry ls BUCKET[/PREFIX]"))
			}
			s, project, err := a.storageSession(cmd.Context())
			if err != nil {
				return err
			}
			l := objectListing{Prefixes: []string{}, Objects: []api.StorageObject{}}
			delim := api.ListStorageObjectsParamsDelimiterEmpty
			var cursor *string
			for {
				p := &api.ListStorageObjectsParams{XProjectID: project, Delimiter: &delim, Cursor: cursor}
				if prefix != "" {
					p.Prefix = &prefix
				}
				res, err := s.API.ListStorageObjectsWithResponse(cmd.Context(), bucket, p)
				if err != nil {
					return err
				}
				if err := ok(res.HTTPResponse, res.Body); err != nil {
					return err
				}
				l.Prefixes = append(l.Prefixes, res.JSON200.CommonPrefixes...)
				l.Objects = append(l.Objects, res.JSON200.Objects...)
				if cursor = res.JSON200.Pagination.NextCursor; cursor == nil {
					break
				}
			}
			return a.printer().Print(l, func(t *output.TableWriter) {
				t.Row("PATH", "BYTES", "UPDATED", "ETAG")
				for _, p := range l.Prefixes {
					t.Row(p, "", "", "")
				}
				for _, o := range l.Objects {
					t.Row(o.Path, fmt.Sprint(o.SizeBytes), ts(o.UpdatedAt), o.Etag)
				}
			})
		},
	}
}

func (a *app) quotaCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "quota",
		Short: "Show the project's storage quota and what it uses",
		Example: `  gantry quota
  gantry quota -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, project, err := a.storageSession(cmd.Context())
			if err != nil {
				return err
			}
			res, err := s.API.GetStorageQuotaWithResponse(cmd.Context(), &api.GetStorageQuotaParams{XProjectID: project})
			if err != nil {
				return err
			}
			if err := ok(res.HTTPResponse, res.Body); err != nil {
				return err
			}
			q := res.JSON200
			return a.printer().Print(q, func(t *output.TableWriter) {
				t.Pairs("Project", q.ProjectID.String(), "Source", string(q.Source),
					"Used bytes", fmt.Sprint(q.UsedBytes), "Reserved bytes", fmt.Sprint(q.ReservedBytes), "Max bytes", fmt.Sprint(q.MaxBytes),
					"Used objects", fmt.Sprint(q.UsedObjects), "Reserved objects", fmt.Sprint(q.ReservedObjects), "Max objects", fmt.Sprint(q.MaxObjects))
			})
		},
	}
}

func (a *app) cpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file to or from a bucket (bucket:NAME/PATH)",
		Long: `Copy one file between this machine and the project's storage. An object is named
bucket:NAME/PATH; anything else is a local path, and "-" is standard input (upload)
or standard output (download). Copying to a local directory keeps the object's base
name. Both ways stream: an upload sends the file with its size as Content-Length; a
download writes a temporary file next to the target, checks the SHA-256 of what
arrived against the object's ETag, and only then renames it into place. Progress is
shown on standard error when it is a terminal.`,
		Example: `  gantry cp ./model.safetensors bucket:checkpoints/run-7/model.safetensors
  gantry cp bucket:checkpoints/run-7/model.safetensors ./model.safetensors
  gantry cp bucket:datasets/labels.csv - | head`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := args[0], args[1]
			switch {
			case strings.HasPrefix(src, uriScheme) && !strings.HasPrefix(dst, uriScheme):
				return a.download(cmd.Context(), src, dst)
			case !strings.HasPrefix(src, uriScheme) && strings.HasPrefix(dst, uriScheme):
				return a.upload(cmd.Context(), src, dst)
			}
			return usageErr(errors.New("exactly one of SRC and DST must be an object (bucket:NAME/PATH)"))
		},
	}
}

func splitBucketPath(s string) (bucket, path string) {
	bucket, path, _ = strings.Cut(s, "/")
	return bucket, path
}

func parseObjectURI(uri string) (bucket, path string, err error) {
	bucket, path = splitBucketPath(strings.TrimPrefix(uri, uriScheme))
	if bucket == "" || path == "" || strings.HasSuffix(path, "/") {
		return "", "", usageErr(fmt.Errorf("%q does not name an object: use bucket:NAME/PATH", uri))
	}
	return bucket, path, nil
}

// storageSession is a session and the project every storage call is scoped to.
func (a *app) storageSession(ctx context.Context) (*apiclient.Session, uuid.UUID, error) {
	s, err := a.session()
	if err != nil {
		return nil, uuid.Nil, err
	}
	project, err := a.project(ctx, s)
	if err != nil {
		return nil, uuid.Nil, err
	}
	return s, project, nil
}

// streamClient is the session's authenticated client without its whole-request
// timeout: an object's transfer lasts as long as its size needs.
func streamClient(s *apiclient.Session) (*api.Client, error) {
	inner, okc := s.API.ClientInterface.(*api.Client)
	if !okc {
		return nil, errors.New("unexpected API client")
	}
	hc, okh := inner.Client.(*http.Client)
	if !okh {
		return nil, errors.New("unexpected HTTP client")
	}
	c := *hc
	c.Timeout = 0
	return api.NewClient(inner.Server, api.WithHTTPClient(&c))
}

func checkResponse(res *http.Response) error {
	if res.StatusCode >= 200 && res.StatusCode < 300 {
		return nil
	}
	body, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	return apiclient.Check(res.StatusCode, res.Header, body)
}

func (a *app) upload(ctx context.Context, src, dst string) error {
	bucket, path, err := parseObjectURI(dst)
	if err != nil {
		return err
	}
	var body io.Reader
	size := int64(-1)
	if src == "-" {
		body = a.in
	} else {
		f, err := os.Open(src)
		if err != nil {
			return usageErr(err)
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		if !st.Mode().IsRegular() {
			return usageErr(fmt.Errorf("%s is not a regular file", src))
		}
		body, size = f, st.Size()
	}
	s, project, err := a.storageSession(ctx)
	if err != nil {
		return err
	}
	c, err := streamClient(s)
	if err != nil {
		return err
	}
	prog := a.progress("upload "+filepath.Base(path), size)
	body = io.TeeReader(body, prog)
	res, err := c.PutStorageObjectWithBody(ctx, bucket, &api.PutStorageObjectParams{XProjectID: project, Path: path}, "application/octet-stream",
		io.NopCloser(body), func(_ context.Context, r *http.Request) error {
			// A file's size is known: send it, so the server can check the quota before
			// any byte lands (stdin goes chunked).
			if size >= 0 {
				r.ContentLength = size
			}
			return nil
		})
	prog.done()
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if err := checkResponse(res); err != nil {
		return err
	}
	fmt.Fprintf(a.errOut, "Uploaded %s to %s%s/%s (%s).\n", src, uriScheme, bucket, path, res.Header.Get("ETag"))
	return nil
}

func (a *app) download(ctx context.Context, src, dst string) error {
	bucket, path, err := parseObjectURI(src)
	if err != nil {
		return err
	}
	if dst != "-" {
		if st, err := os.Stat(dst); err == nil && st.IsDir() {
			dst = filepath.Join(dst, filepath.Base(path))
		}
	}
	s, project, err := a.storageSession(ctx)
	if err != nil {
		return err
	}
	c, err := streamClient(s)
	if err != nil {
		return err
	}
	res, err := c.GetStorageObject(ctx, bucket, &api.GetStorageObjectParams{XProjectID: project, Path: path})
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if err := checkResponse(res); err != nil {
		return err
	}
	etag := strings.Trim(res.Header.Get("ETag"), `"`)
	var out io.Writer = a.out
	var tmp *os.File
	if dst != "-" {
		// The temporary file sits beside the target so the rename is atomic, and a
		// failed or corrupt transfer never replaces what was there.
		tmp, err = os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".gantry-*")
		if err != nil {
			return err
		}
		defer func() {
			if tmp != nil {
				tmp.Close()
				os.Remove(tmp.Name())
			}
		}()
		out = tmp
	}
	h := sha256.New()
	prog := a.progress("download "+filepath.Base(path), res.ContentLength)
	_, err = io.Copy(io.MultiWriter(out, h, prog), res.Body)
	prog.done()
	if err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); etag != "" && got != etag {
		return fmt.Errorf("download of %s corrupt: sha256 %s, ETag %s", src, got, etag)
	}
	if tmp == nil {
		return nil
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return err
	}
	tmp = nil
	fmt.Fprintf(a.errOut, "Downloaded %s to %s.\n", src, dst)
	return nil
}

// progress counts bytes and redraws one status line on a terminal stderr, at most
// every 200 ms; elsewhere it only counts.
type progress struct {
	w     io.Writer
	label string
	total int64
	n     int64
	last  time.Time
	on    bool
}

func (a *app) progress(label string, total int64) *progress {
	p := &progress{w: a.errOut, label: label, total: total}
	if f, isFile := a.errOut.(*os.File); isFile && tty.IsTerminal(int(f.Fd())) {
		p.on = true
	}
	return p
}

func (p *progress) Write(b []byte) (int, error) {
	p.n += int64(len(b))
	if p.on && time.Since(p.last) > 200*time.Millisecond {
		p.last = time.Now()
		p.draw()
	}
	return len(b), nil
}

func (p *progress) draw() {
	if p.total > 0 {
		fmt.Fprintf(p.w, "\r%s: %d/%d MiB (%d%%)", p.label, p.n>>20, p.total>>20, p.n*100/p.total)
	} else {
		fmt.Fprintf(p.w, "\r%s: %d MiB", p.label, p.n>>20)
	}
}

func (p *progress) done() {
	if p.on {
		p.draw()
		fmt.Fprintln(p.w)
	}
}
